from jinja2.runtime import LoopContext, Macro, Markup, Namespace, TemplateNotFound, TemplateReference, TemplateRuntimeError, Undefined, escape, identity, internalcode, markup_join, missing, str_join
name = 'podmonitor.yaml.j2'

def root(context, missing=missing):
    resolve = context.resolve_or_missing
    undefined = environment.undefined
    concat = environment.concat
    cond_expr_undefined = Undefined
    if 0: yield None
    l_0_monitor = resolve('monitor')
    l_0_parts = missing
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
    pass
    l_0_parts = context.vars['parts'] = environment.get_template('parts.j2', 'podmonitor.yaml.j2')._get_default_module(context)
    context.exported_vars.discard('parts')
    yield 'apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata:\n  '
    yield str(t_1(context.call(environment.getattr((undefined(name='parts') if l_0_parts is missing else l_0_parts), 'metadata'), environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'metadata')), 2))
    yield '\nspec:\n  selector:\n    matchLabels: '
    yield str(t_2(environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'selector')))
    yield '\n  podTargetLabels: '
    yield str(t_2(environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'pod_target_labels')))
    yield '\n  podMetricsEndpoints:\n'
    if environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'port_number'):
        pass
        yield '    - path: "/metrics"\n      honorLabels: true\n      interval: '
        yield str(t_2(environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'interval')))
        yield '\n      relabelings:\n        - sourceLabels: ["__meta_kubernetes_pod_container_name"]\n          regex: '
        yield str(t_2(environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'container')))
        yield '\n          action: keep\n        - sourceLabels: ["__meta_kubernetes_pod_ip"]\n          targetLabel: "__address__"\n          replacement: '
        yield str(t_2(str_join(('$1:', environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'port_number'), ))))
        yield '\n        - targetLabel: "endpoint"\n          replacement: '
        yield str(t_2(environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'port_name')))
        yield '\n'
    else:
        pass
        yield '    - port: '
        yield str(t_2(environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'port_name')))
        yield '\n      path: "/metrics"\n      honorLabels: true\n      interval: '
        yield str(t_2(environment.getattr((undefined(name='monitor') if l_0_monitor is missing else l_0_monitor), 'interval')))
        yield '\n'

blocks = {}
debug_info = '12=25&16=28&19=30&20=32&22=34&25=37&28=39&32=41&34=43&36=48&39=50'