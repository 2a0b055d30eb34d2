from jinja2.runtime import LoopContext, Macro, Markup, Namespace, TemplateNotFound, TemplateReference, TemplateRuntimeError, Undefined, escape, identity, internalcode, markup_join, missing, str_join
name = 'pod.yaml.j2'

def root(context, missing=missing):
    resolve = context.resolve_or_missing
    undefined = environment.undefined
    concat = environment.concat
    cond_expr_undefined = Undefined
    if 0: yield None
    l_0_pod = resolve('pod')
    l_0_layout = resolve('layout')
    l_0_parts = l_0_container = l_0_ports = missing
    try:
        t_1 = environment.filters['indent']
    except KeyError:
        @internalcode
        def t_1(*unused):
            raise TemplateRuntimeError("No filter named 'indent' found.")
    try:
        t_2 = environment.filters['tojson']
    except KeyError:
        @internalcode
        def t_2(*unused):
            raise TemplateRuntimeError("No filter named 'tojson' found.")
    try:
        t_3 = environment.tests['none']
    except KeyError:
        @internalcode
        def t_3(*unused):
            raise TemplateRuntimeError("No test named 'none' found.")
    pass
    l_0_parts = context.vars['parts'] = environment.get_template('parts.j2', 'pod.yaml.j2')._get_default_module(context)
    context.exported_vars.discard('parts')
    l_0_container = environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'container')
    context.vars['container'] = l_0_container
    context.exported_vars.add('container')
    yield 'metadata:\n  labels: '
    yield str(t_2(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'labels')))
    yield '\n'
    if environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'annotations'):
        pass
        yield '  annotations: '
        yield str(t_2(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'annotations')))
        yield '\n'
    yield 'spec:\n'
    if environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'restart_policy'):
        pass
        yield '  restartPolicy: '
        yield str(t_2(environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'restart_policy')))
        yield '\n'
    yield '  securityContext:\n    seccompProfile:\n      type: "RuntimeDefault"\n'
    if (environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'grace') and (not t_3(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'termination_grace_seconds')))):
        pass
        yield '  terminationGracePeriodSeconds: '
        yield str(t_2(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'termination_grace_seconds')))
        yield '\n'
    if environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'service_account'):
        pass
        yield '  serviceAccountName: '
        yield str(t_2(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'service_account')))
        yield '\n'
    if environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'priority_class'):
        pass
        yield '  priorityClassName: '
        yield str(t_2(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'priority_class')))
        yield '\n'
    if environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'scheduler_name'):
        pass
        yield '  schedulerName: '
        yield str(t_2(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'scheduler_name')))
        yield '\n'
    if environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'node_selector'):
        pass
        yield '  nodeSelector: '
        yield str(t_2(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'node_selector')))
        yield '\n'
    if environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'tolerations'):
        pass
        yield '  tolerations: '
        yield str(t_2(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'tolerations')))
        yield '\n'
    if environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'affinity'):
        pass
        yield '  affinity: '
        yield str(t_2(environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'affinity')))
        yield '\n'
    if environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'image_pull_secrets'):
        pass
        yield '  imagePullSecrets:\n'
        for l_1_secret in environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'image_pull_secrets'):
            _loop_vars = {}
            pass
            yield '    - name: '
            yield str(t_2(l_1_secret))
            yield '\n'
        l_1_secret = missing
    yield '  containers:\n    - name: '
    yield str(t_2(environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'container')))
    yield '\n'
    if ('image' in environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'carries')):
        pass
        yield '      image: '
        yield str(t_2(environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'image')))
        yield '\n'
    if ('command' in environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'carries')):
        pass
        yield '      command: '
        yield str(t_2(environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'command')))
        yield '\n'
    if (('env' in environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'carries')) and environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'env')):
        pass
        yield '      env:\n        '
        yield str(t_1(context.call(environment.getattr((undefined(name='parts') if l_0_parts is missing else l_0_parts), 'env'), environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'env')), 8))
        yield '\n'
    l_0_ports = ((environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'api_ports') + environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'ports')) if ('ports' in environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'carries')) else ())
    context.vars['ports'] = l_0_ports
    context.exported_vars.add('ports')
    if (undefined(name='ports') if l_0_ports is missing else l_0_ports):
        pass
        yield '      ports:\n'
        for l_1_port in (undefined(name='ports') if l_0_ports is missing else l_0_ports):
            _loop_vars = {}
            pass
            yield '        - name: '
            yield str(t_2(environment.getattr(l_1_port, 'name')))
            yield '\n          containerPort: '
            yield str(t_2(environment.getattr(l_1_port, 'number')))
            yield '\n          protocol: '
            yield str(t_2(environment.getattr(l_1_port, 'protocol')))
            yield '\n'
        l_1_port = missing
    if (('resources' in environment.getattr((undefined(name='layout') if l_0_layout is missing else l_0_layout), 'carries')) and (environment.getattr(environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'resources'), 'requests') or environment.getattr(environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'resources'), 'limits'))):
        pass
        yield '      resources:\n'
        if environment.getattr(environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'resources'), 'requests'):
            pass
            yield '        requests: '
            yield str(t_2(environment.getattr(environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'resources'), 'requests')))
            yield '\n'
        if environment.getattr(environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'resources'), 'limits'):
            pass
            yield '        limits: '
            yield str(t_2(environment.getattr(environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'resources'), 'limits')))
            yield '\n'
    yield '      securityContext:\n        allowPrivilegeEscalation: false\n        capabilities:\n          drop: ["ALL"]\n      volumeMounts:\n'
    for l_1_mount in environment.getattr((undefined(name='container') if l_0_container is missing else l_0_container), 'volume_mounts'):
        _loop_vars = {}
        pass
        yield '        - name: '
        yield str(t_2(environment.getattr(l_1_mount, 'name')))
        yield '\n          mountPath: '
        yield str(t_2(environment.getattr(l_1_mount, 'path')))
        yield '\n'
        if environment.getattr(l_1_mount, 'read_only'):
            pass
            yield '          readOnly: true\n'
        if environment.getattr(l_1_mount, 'sub_path'):
            pass
            yield '          subPath: '
            yield str(t_2(environment.getattr(l_1_mount, 'sub_path')))
            yield '\n'
    l_1_mount = missing
    yield '  volumes:\n'
    for l_1_volume in environment.getattr((undefined(name='pod') if l_0_pod is missing else l_0_pod), 'volumes'):
        _loop_vars = {}
        pass
        yield '    - name: '
        yield str(t_2(environment.getattr(l_1_volume, 'name')))
        yield '\n      '
        yield str(t_2(environment.getattr(l_1_volume, 'type')))
        yield ': '
        yield str(t_2(environment.getattr(l_1_volume, 'source')))
        yield '\n'
    l_1_volume = missing

blocks = {}
debug_info = '8=32&9=34&11=38&12=40&13=43&16=46&17=49&22=52&23=55&25=57&26=60&28=62&29=65&31=67&32=70&34=72&35=75&37=77&38=80&40=82&41=85&43=87&45=90&46=94&50=98&51=100&52=103&54=105&55=108&57=110&59=113&61=115&62=118&64=121&65=125&66=127&67=129&70=132&72=135&73=138&75=140&76=143&84=146&85=150&86=152&87=154&90=157&91=160&95=164&96=168&97=170'